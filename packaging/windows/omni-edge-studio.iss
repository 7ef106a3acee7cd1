; Inno Setup 6 script of the Windows installer of Omni Edge Studio.
;
; From the repository root, on Windows x64 with Python 3.11 and the development extra:
;   1. pyinstaller --noconfirm packaging\omni-edge-studio.spec
;        writes dist\omni-edge-studio\ (omni-edge-studio.exe and _internal\)
;   2. iscc /DAppVersion=<runtime.__version__> packaging\windows\omni-edge-studio.iss
;        writes dist\omni-edge-studio-<version>-windows-x64-setup.exe
;   3. Check the installed application: "%LOCALAPPDATA%\Programs\Omni Edge Studio\
;      omni-edge-studio.exe" --self-test --report %TEMP%\self-test.json
;
; Relative paths below are relative to this file. The installer installs for the current
; user by default (no administrator rights; the dialog offers all users). The application
; keeps its user data in %LOCALAPPDATA%\omni-edge-studio and its settings in the same
; platform folders (platformdirs), never in the installation folder; uninstalling leaves
; that data in place.

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#define AppName "Omni Edge Studio"
#define AppExe "omni-edge-studio.exe"
#define FrozenApp "..\..\dist\omni-edge-studio"

[Setup]
AppId={{8D266CF6-F682-4D47-B9C3-11C64380EEEE}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=Omni Edge Studio
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0
OutputDir=..\..\dist
OutputBaseFilename=omni-edge-studio-{#AppVersion}-windows-x64-setup
SetupIconFile=..\..\assets\icon\omni-edge-studio.ico
UninstallDisplayIcon={app}\{#AppExe}
UninstallDisplayName={#AppName} {#AppVersion}
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
CloseApplications=yes

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
; The whole one-folder application PyInstaller wrote; nothing else is installed.
Source: "{#FrozenApp}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\{#AppExe}"; Comment: "Run multi-stage local AI pipelines on the devices of this PC"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExe}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent
